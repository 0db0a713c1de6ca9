"""Byte units, one definition for the course.

Binary units (``KiB = 2**10``, ``MiB = 2**20``, ``GiB = 2**30``) are what PyTorch's allocator, NVML and
``nvidia-smi`` count in (nvidia-smi prints "MiB"); decimal ``GB = 10**9`` is what model cards and GPU
data sheets quote ("an 80 GB H100"). A number printed in one and read in the other is off by 7.4 %
at the GiB scale (IEC 80000-13 names the binary prefixes)."""
KiB, MiB, GiB = 1024, 1024**2, 1024**3
GB = 10**9
