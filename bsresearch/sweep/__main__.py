"""`python -m bsresearch.sweep`: the worker process of a sweep. It reads one RunTask as JSON on stdin and
executes it (see worker.py); supervise.run_task starts it. To run a sweep, use `bsresearch sweep SPEC`."""
import sys

from .worker import main

sys.exit(main())
