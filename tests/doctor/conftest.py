from tests.analysis.sites import site_030, site_0401

__all__ = ["site_030", "site_0401"]
