"""Bottom layer: record files and their errors, shipped resources, process isolation, atomic writes, caches."""
