"""What the measuring script asked of the stand-ins, appended to $MEASURE_FAKES_LOG as JSON lines."""
import json
import os


def record(what, **details):
    with open(os.environ["MEASURE_FAKES_LOG"], "a") as log:
        log.write(json.dumps({"call": what, **details}, default=str) + "\n")
