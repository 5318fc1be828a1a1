"""Names on the Hugging Face hub, fetched once into huggingface_hub's cache, where a later run
(HF_HUB_OFFLINE=1 too) finds them: a model (ORG/NAME) and a repository's file
(hf://datasets/ORG/NAME[@REVISION]/PATH, parsed by huggingface_hub's parse_hf_uri: a revision may
hold `/`, written as is or as %2F). `commits` records the commit each name resolved to, the
snapshot folder's name in the cache: config.json keeps them, and a --resume on another commit is
refused like any other changed value."""
import glob
import os
import re
import shutil

from machinery import UserError, builtin
from machinery.files import write_atomic

# name as given -> the commit it resolved to, for this process's run (rank 0 fetches)
commits = {}


def model_folder(path: str, cache_dir: str, build: bool = True) -> str:
    """A --model_path's folder: `path` itself; a hub model's (namespace/name, not a folder here)
    config, tokenizer and safetensors weights, fetched; or a built-in model's (builtin.py)."""
    if path.startswith("builtin:"):
        return builtin.model_folder(path, cache_dir, build)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", path) or os.path.exists(path):
        return path
    # what transformers and vLLM read: config, tokenizer, safetensors weights
    return snapshot(path, "cannot fetch it from the hub", path,
                    ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"])


def snapshot(name: str, refusal: str, repo: str, patterns: list, **where) -> str:
    """The snapshot folder of `repo`'s files that match `patterns`, fetched; its name, the
    commit, is recorded as `name`'s. Or the refusal and why not: offline and not cached, no such
    repository or revision, no network."""
    from huggingface_hub import snapshot_download
    try:
        folder = snapshot_download(repo, allow_patterns=patterns, **where)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{name}: {refusal} ({reason})") from None
    commits[name] = os.path.basename(folder)
    return folder


def local_file(path: str, cache_dir: str) -> str:
    """A data file on this machine: `path` itself, or a hub dataset's file fetched. A PATH
    ending in `.part-*` names the pieces of one file (the authors' pool ships so): each fetched,
    then joined in name order into cache_dir, once."""
    if not path.startswith("hf://"):
        return path
    from huggingface_hub import parse_hf_uri
    try:
        uri = parse_hf_uri(path)
    except ValueError:
        uri = None
    if uri is None or uri.type != "dataset" or not uri.path_in_repo:
        raise UserError(f"{path}: a hub data file is hf://datasets/ORG/NAME[@REVISION]/PATH")
    name = uri.path_in_repo
    folder = snapshot(path, "cannot fetch it", uri.id, [name], repo_type="dataset",
                      revision=uri.revision)
    # PATH is the pattern the fetch took (fnmatch's, as glob's): the file, or its pieces
    pieces = sorted(glob.glob(os.path.join(folder, name)))
    if not pieces:
        raise UserError(f"{path}: cannot fetch it (no such file in {uri.id})")
    if not name.endswith(".part-*"):
        return pieces[0]
    # the snapshot's folder name is its commit: another revision joins anew
    joined = os.path.join(cache_dir, "hub", uri.id.replace("/", "--"), commits[path],
                          name.removesuffix(".part-*"))
    if not os.path.isfile(joined):
        os.makedirs(os.path.dirname(joined), exist_ok=True)

        def join(temporary):
            with open(temporary, "wb") as out:
                for piece in pieces:
                    with open(piece, "rb") as f:
                        shutil.copyfileobj(f, out)
        write_atomic(joined, join)  # a full disk: one line, no half file left
        print(f"{path}: {len(pieces)} pieces joined into {joined}", flush=True)
    return joined
