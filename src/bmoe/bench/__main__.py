import sys

from bmoe.bench.main import main

sys.exit(main())
