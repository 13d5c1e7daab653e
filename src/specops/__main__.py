from specops.cli import main

raise SystemExit(main())
