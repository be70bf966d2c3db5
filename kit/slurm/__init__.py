"""The Slurm launcher (`launcher: slurm`): the Plan as one batch script (`script`), the job it
runs as (`jobs`: sbatch, squeue, scancel), and `pdkit up`/`down`/`status` through it
(`launcher`). The readiness gates, the KV transfer gate and the router are kit/deploy's, as
with Ansible."""
