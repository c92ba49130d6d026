"""``python -m kvdrift.cli``."""

from kvdrift.cli import main

main()
