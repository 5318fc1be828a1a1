"""A micro-batch as tensors: rows of [prompt | response] (or, sharing prompts, a prompt once
then each of its responses under a block-causal mask), the positions vLLM used, and where each
response token's log-prob comes from and goes."""
import collections

import torch


def collate(samples: list, pad_id: int, device, share_prompts: bool = False) -> dict:
    """A micro-batch as tensors; a row is [prompt | response], positions from 0 as in vLLM. With
    share_prompts a row holds a prompt once, then each of its responses, each seeing only the
    prompt and itself (a block-causal mask): the prompt's forward and backward run once, not n
    times. Otherwise the mask stays 2-D (fused attention kernels). samples: objects with
    (prompt_ids, completion_ids, advantage, replay, old_logprobs). The keys TokenLogProbs reads:
    input_ids, position_ids, attention_mask; sources, the flat (row, column) of the state that
    predicts each response token; targets, those tokens; completion_index, where each lands in
    the (S, L) output."""
    members = collections.defaultdict(list)  # row key -> the indices of its samples
    for i, s in enumerate(samples):
        members[tuple(s.prompt_ids) if share_prompts else i].append(i)
    # per row: tokens, positions, segments (0: the prompt, j: its j-th response)
    tokens, positions, segments = [], [], []
    # per sample: the (row, column) of the state that predicts each of its tokens
    sources = [None] * len(samples)
    for ids in members.values():
        prompt = samples[ids[0]].prompt_ids
        p = len(prompt)
        r = len(tokens)
        tokens.append(list(prompt))
        positions.append(list(range(p)))
        segments.append([0] * p)
        for j, i in enumerate(ids):
            completion = samples[i].completion_ids
            # state t - 1 predicts token t: the first token's is the prompt's last
            start = len(tokens[r])
            sources[i] = [(r, p - 1)] + [(r, start + t) for t in range(len(completion) - 1)]
            tokens[r] += completion
            # positions continue the prompt's, as vLLM numbers them
            positions[r] += range(p, p + len(completion))
            segments[r] += [j + 1] * len(completion)
    length = max(map(len, tokens))

    def pad(lists, value):  # -> (R, L)
        return torch.tensor([x + [value] * (length - len(x)) for x in lists])

    segments = pad(segments, -1)  # (R, L), -1 on padding
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)  # (R, L, 1), (R, 1, L)
    # a token sees the prompt and its own response, causally: (R, 1, L, L)
    attention = ((key == 0) | (key == query)).tril().unsqueeze(1)
    if not share_prompts:
        attention = (segments >= 0).long()  # (R, L)
    lengths = torch.tensor([len(s.completion_ids) for s in samples])  # (S,)
    completion_mask = torch.arange(int(lengths.max())) < lengths.unsqueeze(1)  # (S, L)
    batch = {
        "input_ids": pad(tokens, pad_id),  # (R, L)
        "position_ids": pad(positions, 0),  # (R, L)
        "attention_mask": attention,
        "sources": torch.tensor([r * length + t for s in sources for r, t in s]),  # (tokens,)
        "targets": torch.tensor([t for s in samples for t in s.completion_ids]),  # (tokens,)
        "completion_mask": completion_mask.long(),  # (S, L)
        # (tokens,) positions in (S * L), in the order of targets
        "completion_index": completion_mask.flatten().nonzero().squeeze(1),
        "advantages": torch.tensor([s.advantage for s in samples]).float(),  # (S,)
        "replays": torch.tensor([s.replay for s in samples]),  # (S,)
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    if all(s.old_logprobs is not None for s in samples):
        # π_θold, carried by the samples as their advantages are (epochs after the first)
        batch["old_logprobs"] = torch.nn.utils.rnn.pad_sequence(
            [s.old_logprobs for s in samples], batch_first=True)  # (S, L), 0 after the end
    batch["samples"] = samples
    # the rows' real tokens: what the forward costs
    batch["row_tokens"] = sum(map(len, tokens))
    return batch
