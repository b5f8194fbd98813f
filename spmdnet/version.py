"""The package version, in a leaf module: ``spmdnet.__version__`` and the
checkpoint metadata both read it here, so nothing imports the package's
``__init__`` while it runs."""
__version__ = "0.1.0"
