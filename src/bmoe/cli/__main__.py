"""``python -m bmoe.cli``."""

from bmoe.cli import main

raise SystemExit(main())
