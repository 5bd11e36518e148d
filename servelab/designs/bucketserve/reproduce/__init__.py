"""BucketServe reproduction (``run``): offline throughput, online attainment, breakdown."""
