"""The rank group: the ranks of a multi-node instance live and die as one.

Each rank of a multi-node instance runs under a small agent (``python -m kit.ranks``) that
starts SGLang's process (or the sim's) as its child. The agent beside node rank 0 leads: the
others connect to it, and it starts the group only once every one is there, rank 0 first.
When any rank's process dies (or its agent, or its host, goes silent) the leader stops every
rank and starts them all again, so that a rank never tries to rejoin a torch group that runs
without it, and no rank above 0 ever starts alone, at boot or after a failure.

group     the leader's and the followers' loops, their line protocol and the child processes
"""
