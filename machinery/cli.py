"""The command line from a dataclass: a flag per field, its help the field's comment.

argparse rather than a library that builds flags from a dataclass (tyro, transformers'
HfArgumentParser): each needs its help in a `metadata` dict or a docstring beside the field, where
Config keeps it as the field's comment, read on one line with its paper default; and a bad value
must be one line and exit 2, which argparse's parser.error gives."""
import argparse
import inspect
import re


def dataclass_flags(cls):
    """(name, argparse settings) of each field of the dataclass `cls`, from its line in the
    class's source, the one place a field is described: the help is its comment, a leading "{a,
    b}: " the values it takes (a field without a comment gets no flag)."""
    source = inspect.getsource(cls)
    for name, comment in re.findall(r"^ +(\w+): \w+ = .*?  # (.*)$", source, re.M):
        kind = cls.__annotations__[name]
        flag = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        values, text = re.fullmatch(r"(?:\{([^}]*)\}: )?(.*)", comment).groups()
        flag["help"] = text.replace("%", "%%")  # argparse formats help with %
        if values:
            flag["choices"] = values.split(", ")
        yield name, flag
