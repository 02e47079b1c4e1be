import sys

from bmoe.bench.trained.main import main

sys.exit(main())
