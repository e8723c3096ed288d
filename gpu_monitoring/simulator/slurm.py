"""A scenario's Slurm jobs: where slurmstepd puts each job's GPU processes, and what they inherit.

    slurm:
      cgroup_version: 2             # default; 1 for Slurm's legacy cgroup/v1 plugin
      nodename: gpu-a17             # only where the host runs several slurmd (--enable-multiple-slurmd)
      jobs:
        - id: 48213
          name: llama3-pretrain     # what sbatch/srun export: SLURM_JOB_NAME, SLURM_JOB_USER,
          user: alice               # SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION
          uid: 1001
          account: nlp
          partition: gpu
          step: "0"                 # default; or batch, extern, interactive
          processes: [51001, 51002] # pids of the scenario's GPU processes, one task each
"""

from typing import Any, Dict, Mapping

from gpu_monitoring.simulator.proc_root import slurm_cgroup_text

# Spelled out here rather than taken from the code that reads them, so that a wrong name there fails a test.
_EXPORTED = {"SLURM_JOB_NAME": "name", "SLURM_JOB_USER": "user", "SLURM_JOB_ACCOUNT": "account",
             "SLURM_JOB_PARTITION": "partition"}
_LOGIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def slurm_processes(raw: Mapping[str, Any]) -> Dict[int, Dict[str, Any]]:
    """{pid: proc root entries (cgroup text, uid, environ)} of every job's GPU processes."""
    version, nodename = raw.get("cgroup_version", 2), raw.get("nodename")
    return {
        pid: _task(job, task, version, nodename)
        for job in raw.get("jobs", [])
        for task, pid in enumerate(job.get("processes", []))
    }


def _task(job: Mapping[str, Any], task: int, version: int, nodename: Any) -> Dict[str, Any]:
    step, uid = str(job.get("step", "0")), int(job.get("uid", 1000))
    environ = dict(_LOGIN_ENV, SLURM_JOB_ID=str(job["id"]), SLURM_PROCID=str(task), SLURM_LOCALID=str(task))
    environ.update({name: str(job[key]) for name, key in _EXPORTED.items() if key in job})
    return {
        "cgroup": slurm_cgroup_text(job["id"], step, uid, task, version, nodename),
        "uid": uid,
        "environ": environ,
    }
