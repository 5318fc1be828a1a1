"""The policy: a causal LM in float32 read by rank 0 alone, sharded by FSDP2 over the ranks
(weights, gradients and AdamW's state), and its log-probs of response tokens at the run's
temperature (TokenLogProbs), computed from a micro-batch collate made."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from machinery.ranks import Dist


def load_model(path: str, d: Dist, gradient_checkpointing: bool):
    """A causal LM for training, float32, in train mode: read from `path` by rank 0 (or the one
    process); under torchrun the other ranks build it on the meta device and receive their shards
    in shard() (one host copy of the weights, not W)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    # sdpa reads a boolean 4-D mask (share_prompts) as "may attend"
    settings = dict(dtype=torch.float32, attn_implementation="sdpa")
    if d.master_process or not d.distributed:
        model = AutoModelForCausalLM.from_pretrained(path, **settings)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                     **settings)
    model.config.use_cache = False
    # from_pretrained returns eval mode, where transformers skips gradient checkpointing
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def shard(policy: torch.nn.Module, model, d: Dist, gather_bf16: bool):
    """The policy on the rank's device. Under torchrun FSDP2 shards its weights, gradients and
    AdamW state, a unit per decoder layer, and rank 0's weights fill every rank's shards."""
    if not d.distributed:
        model.to(d.device)
        return
    full_weights = model.state_dict() if d.master_process else {}
    # bf16 runs gather bf16 weights (half the bytes; autocast casts them anyway) and reduce
    # gradients in fp32, as verl; the batch's floats are the loss's
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 cast_forward_inputs=False)
    mp_policy = mixed if gather_bf16 else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    # the root unit gathers the embeddings, final norm and LM head
    fully_shard(policy, mp_policy=mp_policy)
    load_from_rank0(model, full_weights, d)


def load_from_rank0(model, full_weights: dict, d: Dist):
    """Rank 0's full weights into every rank's shards; the other ranks built on meta."""
    if not d.master_process:
        model.to_empty(device=d.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_weights, options=options)
    # buffers outside the state dict (rotary inv_freq) were not sent: rank 0's go now
    for _, buffer in sorted(model.named_buffers()):
        dist.broadcast(buffer, src=0)


class TokenLogProbs(torch.nn.Module):
    """log π_θ(o_t | q, o_<t) per response token, from logits / T, of a micro-batch from collate
    (below); the LM head runs on chunks of tokens (all logits at once: the largest tensor)."""

    def __init__(self, model, temperature: float, chunk_tokens: int = 1024):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens

    def _chunk_logps(self, hidden, targets):  # (tokens, H), (tokens,) -> (tokens,)
        # h W / T as (h / T) W: a division of (tokens, H), not of (tokens, V)
        logits = self.model.lm_head(hidden / self.temperature)  # (tokens, V)
        # log softmax and gather in one fused op
        return -F.cross_entropy(logits.float(), targets, reduction="none")

    def forward(self, batch: dict) -> torch.Tensor:
        """(S, L) log-probs, 0 after each response's end."""
        hidden = self.model.model(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"],
                                  position_ids=batch["position_ids"]).last_hidden_state
        # the state before each response token: (R, L, H) -> (tokens, H)
        hidden = hidden.flatten(0, 1)[batch["sources"]]
        targets = batch["targets"]  # (tokens,)
        logps = []
        for i in range(0, targets.numel(), self.chunk_tokens):
            chunk = slice(i, i + self.chunk_tokens)
            # recomputed in backward: one chunk of logits alive at a time
            logps.append(torch.utils.checkpoint.checkpoint(
                self._chunk_logps, hidden[chunk], targets[chunk], use_reentrant=False))
        out = hidden.new_zeros(batch["completion_mask"].shape, dtype=torch.float32)  # (S, L)
        # integer positions: a boolean mask would sync with the host
        out.view(-1)[batch["completion_index"]] = torch.cat(logps)
        return out
