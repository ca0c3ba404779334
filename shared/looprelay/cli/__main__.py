"""``python -m looprelay.cli``."""

from looprelay.cli.root import main

main()
