"""`python -m localstate.cli`: the same command as the `localstate` entry point."""

from localstate.cli import main

raise SystemExit(main())
