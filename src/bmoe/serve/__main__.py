"""``python -m bmoe.serve``."""

from bmoe.serve.main import main

raise SystemExit(main())
