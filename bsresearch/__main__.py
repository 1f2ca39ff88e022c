import sys

from .cli import main

code = main()
place = sys.modules.get("bsresearch.devices.place")
if place is not None:   # a device process (torchrun): leave without the teardown where gloo's threads can abort
    place.leave_process(code)
raise SystemExit(code)
