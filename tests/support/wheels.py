"""testing.wheels, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.wheels import WHEEL_SUFFIXES, cache_dir, fetch_wheel, python_with, site_with, unpack_into

__all__ = ["WHEEL_SUFFIXES", "cache_dir", "fetch_wheel", "python_with", "site_with", "unpack_into"]
