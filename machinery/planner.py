"""The update's plan: which rows each rank trains in each pass. A mini-batch is a run of the
step's shuffled prompts (rlep.plan_mini_batches); its rows are cut into micro-batches that fit in
memory and dealt to the ranks so that every rank runs as many passes (FSDP2's lockstep), a rank
with fewer rows running idle ones of exactly zero gradient; one exchange a step sends each rank
the rows planned for it that another rank generated. Memory and balance, not math: a row carries
its advantage, and the loss's N is the mini-batch's."""
from typing import NamedTuple

from machinery.ranks import Dist, exchange, gather_lists


class GroupSize(NamedTuple):
    position: int  # the prompt's place in the step's order
    response_tokens: int
    row_lengths: tuple  # per sample: prompt + response tokens, a row's length
    rank: int = 0  # the rank that generated the group and holds it


class Split(NamedTuple):
    """How a rank's share of a mini-batch is cut into micro-batches (memory, not math)."""
    max_rows: int  # rows a micro-batch holds when max_tokens is 0
    max_tokens: int  # padded tokens a micro-batch holds, longest rows first; 0: by rows
    share_prompts: bool  # a row holds a prompt once, then its responses (collate)


def split_micro_batches(row_lengths: list[int], count: int, max_rows: int,
                        max_tokens: int) -> list[list[int]]:
    """A rank's rows as `count` micro-batches (lists of indices), fewer if it holds fewer rows,
    more if they need more (0: the fewest). Each is a run of the rows, longest first within
    max_tokens padded tokens (rows x the longest; verl's dynamic batch size, for a trainer that
    pads), or in order within max_rows if max_tokens is 0 (share_prompts keeps a group together);
    each near an equal share of the tokens. Memory, not math: the loss is a token sum."""
    order = list(range(len(row_lengths)))
    if max_tokens:
        # stable: every rank computes the same split
        order.sort(key=lambda i: -row_lengths[i])
    lengths = [row_lengths[i] for i in order]
    # the most rows a run starting there takes (sorted: a run's first row is its longest)
    fits = [max(1, max_tokens // length) if max_tokens else max_rows for length in lengths]
    # needs[i]: the fewest runs for rows i, i + 1, ... (each run filled)
    needs = [0] * (len(order) + 1)
    for start in reversed(range(len(order))):
        needs[start] = 1 + needs[min(len(order), start + fits[start])]
    micro_batches = []
    start, left_tokens = 0, sum(lengths)  # tokens left: the target stays linear in the rows
    for left in range(min(max(count, needs[0]), len(order)), 0, -1):  # runs left
        target = left_tokens / left
        def miss(stop):  # how far rows start to stop, padded, are from the target
            return abs((stop - start) * max(lengths[start:stop]) - target)
        # its rows fit, and each later run keeps a row
        limit = min(start + fits[start], len(order) - left + 1)
        end = start + 1
        # grow while the later runs cannot hold the rest, then toward the target
        while end < limit and (needs[end] >= left or miss(end + 1) <= miss(end)):
            end += 1
        micro_batches.append(order[start:end])
        left_tokens -= sum(lengths[start:end])
        start = end
    # heaviest first: a lockstep pass waits on its heaviest rank
    micro_batches.sort(key=lambda run: -len(run) * max(row_lengths[i] for i in run))
    return micro_batches


def plan_micro_batches(positions, sizes: dict, world_size: int,
                       split: Split) -> list[list[list[tuple[int, int]]]]:
    """Every rank's micro-batches of a mini-batch, lists of (position, sample) pairs, as many on
    every rank (FSDP2 gathers the weights in each forward and backward and reduces the gradients,
    for one token as for 16,384). Rows, not groups: W x passes micro-batches of near-equal
    tokens, longest rows first, dealt to the ranks in turn, so none idles while rows last (RLEP's
    56 or 57 prompts reach all 64 ranks; whole groups leave 7 or 8 none). A row carries its Â and
    N is the mini-batch's: where it trains does not change the loss. A row holding a group
    (share_prompts) stays where it was made. Any rank plans every rank's; on one, it is
    split_micro_batches."""
    rows = [(p, i) for p in positions for i in range(len(sizes[p].row_lengths))]
    def cut(held, count):  # -> count micro-batches of held, or more, or fewer rows
        lengths = [sizes[p].row_lengths[i] for p, i in held]
        return [[held[j] for j in micro]
                for micro in split_micro_batches(lengths, count, split.max_rows, split.max_tokens)]
    if split.share_prompts:
        held = [[(p, i) for p, i in rows if sizes[p].rank == r] for r in range(world_size)]
        passes = max(len(cut(rows_r, 0)) for rows_r in held)
        return [cut(rows_r, passes) for rows_r in held]
    passes = -(-len(cut(rows, 0)) // world_size)  # the fewest micro-batches / W, up
    # heaviest first, dealt in turn: pass j on every rank holds the j-th W of them
    micro_batches = cut(rows, passes * world_size)
    return [micro_batches[rank::world_size] for rank in range(world_size)]


def group_sizes(my_groups: dict, d: Dist) -> dict:
    """Every rank's groups as {position: GroupSize} (one small gather) from this rank's, {position
    in the step: group}: each group's response tokens, the end token and the replays' included,
    whose sum over a mini-batch is its N; its rows' lengths, by which the rows are dealt."""
    mine = [GroupSize(position, sum(len(s.completion_ids) for s in group),
                      tuple(len(s.prompt_ids) + len(s.completion_ids) for s in group),
                      d.rank) for position, group in my_groups.items()]
    return {g.position: g for g in gather_lists(mine, d)}


def deal(my_groups: dict, sizes: dict, runs: list, split: Split, d: Dist,
         idle) -> tuple[dict, dict]:
    """The step's rows dealt to the ranks: this rank's micro-batches of each mini-batch (a run of
    positions: runs are the same in every epoch, in another order), {tuple(run): lists of
    samples}, as many as every other rank's; and the rows it trains, {(position, sample):
    sample}: those of its groups planned here, and those the other ranks send (one exchange a
    step; π_θold stays with its row). Lockstep: a rank with fewer rows than the passes (or none)
    runs an idle micro-batch for each missing one, [idle] (the update's sample of one token with
    Â = 0: an exactly zero gradient)."""
    plans = {tuple(run): plan_micro_batches(run, sizes, d.world_size, split) for run in runs}
    # to each rank, the rows of this rank's groups planned there
    outgoing = [[((p, i), my_groups[p][i]) for plan in plans.values() for micro in plan[rank]
                 for p, i in micro if p in my_groups] for rank in range(d.world_size)]
    rows = dict(exchange(outgoing, d))
    dealt = {}
    for run, plan in plans.items():
        mine = [[rows[pair] for pair in pairs] for pairs in plan[d.rank]]
        dealt[run] = mine + [[idle]] * (max(map(len, plan)) - len(mine))
    return dealt, rows
