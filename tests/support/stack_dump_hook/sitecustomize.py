"""Stack dumps on demand in every Python process started with this folder on its path.

When ``LOCALSTATE_STACK_DUMPS`` names a folder, SIGUSR2 makes the process write the stacks of
all its threads to ``<folder>/<pid>.txt`` (`faulthandler`, from a C signal handler: it works
while the process is blocked in a system call or holding the GIL in a long C call). The chaos
tests send it to a triggerer that failed to do what Airflow promises, to show where it was.
"""

import faulthandler
import os
import signal

_folder = os.environ.get("LOCALSTATE_STACK_DUMPS")
if _folder:
    os.makedirs(_folder, exist_ok=True)
    # kept open for the process's life: faulthandler writes to its file descriptor
    _dump_file = open(os.path.join(_folder, f"{os.getpid()}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR2, file=_dump_file, all_threads=True)
