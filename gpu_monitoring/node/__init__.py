"""The node around the GPUs as the kernel shows it: PCI functions and their links, RDMA ports, the driver's
GPUs, the boot, cgroups, Slurm jobs and the kernel's log."""
