"""`python -m kit.lb ARGS`: run the PD load balancer."""

from kit.lb import main

raise SystemExit(main())
