"""What a task learns about its job's other tasks: the rendezvous of a gang (distributed training:
PyTorch DDP / torchrun, NCCL, MPI), from the fields of its launch (proto/v1/agent.proto).

GoSched's own variables, set for every task of a master that sends them:
* GOSCHED_NUM_TASKS: the job's tasks over all its groups (Slurm's SLURM_NTASKS);
* GOSCHED_ROLE_INDEX, GOSCHED_ROLE_REPLICAS: the task's index among its group's replicas and
  their number (GOSCHED_TASK_ROLE names the group; GOSCHED_TASK_INDEX numbers across groups, in
  the groups' order, so a group's tasks hold indexes GOSCHED_TASK_INDEX - GOSCHED_ROLE_INDEX on);
* GOSCHED_TASK_HOSTS: the address of each task's node, comma-separated, in task index order
  (Slurm's SLURM_JOB_NODELIST, one entry per task; empty for a task not bound at the launch). Not
  set for a job too large to list (the master sends more than 4096 tasks' hosts for none, and a
  list over MAX_HOSTS_CHARS would not fit in the environment): its leader's is still set;
* GOSCHED_LEADER_HOST, GOSCHED_LEADER_PORT: task 0's address, and a port for the rendezvous there
  that is the same for every task and every run of the job (a hash of its id).

And, for a job of two tasks or more, the conventional ones that torch.distributed's env://
initialisation (and Kubeflow's PyTorchJob) use: WORLD_SIZE, RANK (the task's index), MASTER_ADDR and
MASTER_PORT (the leader's). They go under the job's own env, so a job that sets one keeps its value.
A single-task job gets none of them: it needs no rendezvous, and a program that starts a process
group whenever RANK is set would now bind a port.

A launch from an older master carries none of the fields (num_tasks 0): no such variable is set.
"""

from gosched.proto.v1 import agent_pb2

# An environment string (NAME=value) is at most 128 KiB (Linux's MAX_ARG_STRLEN): a longer host
# list would keep the task from starting at all.
MAX_HOSTS_CHARS = 100_000


def gang_env(msg: agent_pb2.LaunchTask) -> dict[str, str]:
    """The rendezvous variables of the launch (none for a launch without them)."""
    if msg.num_tasks <= 0:
        return {}
    hosts = list(msg.task_hosts)
    env = {
        "GOSCHED_NUM_TASKS": str(msg.num_tasks),
        "GOSCHED_ROLE_INDEX": str(msg.role_index),
        "GOSCHED_ROLE_REPLICAS": str(msg.role_replicas),
    }
    listed = ",".join(hosts)
    if len(hosts) == msg.num_tasks and len(listed) <= MAX_HOSTS_CHARS:  # else: the leader's alone
        env["GOSCHED_TASK_HOSTS"] = listed
    leader = hosts[0] if hosts else ""
    if leader:
        env["GOSCHED_LEADER_HOST"] = leader
    if msg.leader_port > 0:
        env["GOSCHED_LEADER_PORT"] = str(msg.leader_port)
    if msg.num_tasks >= 2:
        env["WORLD_SIZE"] = str(msg.num_tasks)
        env["RANK"] = str(msg.index)
        if leader:
            env["MASTER_ADDR"] = leader
        if msg.leader_port > 0:
            env["MASTER_PORT"] = str(msg.leader_port)
    return env
