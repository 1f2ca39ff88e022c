import sys

from .cli import main

code = main()
place = sys.modules.get("bsresearch.devices.place")
if place is not None:   # a device process (torchrun, srun) that joined a group ends there, its results written
    place.leave_process(code)
raise SystemExit(code)
