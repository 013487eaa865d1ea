"""khorovod test suite (a package, so pytest puts the repo root on sys.path, not tests/)."""
