from specops import collector

collector.for_imports()

from specops.cli import main  # noqa: E402  (after the collector's settings: they cover this import too)

code = main()
collector.before_exit()
raise SystemExit(code)
