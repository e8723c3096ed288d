from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
ABOUT: dict = {}
exec((HERE / "gpu_monitoring" / "__about__.py").read_text(), ABOUT)

setup(
    name="datadog-gpu-monitoring",
    version=ABOUT["__version__"],
    description="Datadog Agent check and node sidecar for NVIDIA GPU fleets",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.9",
    packages=find_packages(include=["gpu_monitoring", "gpu_monitoring.*"]),
    package_data={
        "gpu_monitoring": ["metrics.yaml", "simulator/scenarios/*.yaml"],
    },
    install_requires=[
        # The Agent ships the base package with its "deps" extra already installed;
        # standalone installs (CLI, sidecar image) need the extra too.
        "datadog-checks-base[deps]>=37.0.0",
        "grpcio>=1.48",
        "nvidia-ml-py>=12.535.77",
        "pyyaml>=5.4",
        "requests>=2.27",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "datadog-checks-dev>=35",
            "ruff>=0.6",
            # tests/test_deploy.py: render the Helm chart (Helm's Go engine, no helm binary) and
            # validate the manifests against the Kubernetes schemas.
            'helm-python-sdk>=0.2.2; python_version >= "3.10"',
            "kubernetes-validate>=1.30",
        ],
    },
    entry_points={"console_scripts": ["gpu-monitoring=gpu_monitoring.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Monitoring",
    ],
)
