"""PySpark jobs over store files (issue 6): export, reindex, verify, statistics."""
