"""A data row's schema, checked by pydantic: what each field must be, and a refusal that names the
file, the row and the field. Imported only where rows are read (machinery/data.py): a script that
reads no file (benchmarks/bench_trainer.py on a GPU image without pydantic) never needs it."""
import math
from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt,
                      StrictStr, ValidationError)

from machinery import UserError


def finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("not finite")
    return x


# A row's fields, checked by pydantic (strict: no bool for a number, no number for a text): a
# refusal names the file, the row and the field, with what the field must be (rules).
Text = Annotated[StrictStr, Field(pattern=r"\S")]
Answer = Text | StrictInt | Annotated[StrictFloat, AfterValidator(finite)]


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: StrictStr


def has_user_turn(messages: list) -> list:
    if not any(m.role == "user" and m.content.strip() for m in messages):
        raise ValueError("no user turn")
    return messages


Prompt = Annotated[list[Message], Field(min_length=1), AfterValidator(has_user_turn)]


class Row(BaseModel):
    """Our keys (other keys are not read)."""
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | StrictInt | None = None
    problem: Text
    answer: Answer
    prompt: Prompt | None = None  # chat messages, the template not used
    responses: list[StrictStr] | None = None  # a pool's verified answers
    data_source: StrictStr | None = None  # validation reports accuracy per source


class RewardModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ground_truth: Answer
    candidates: list[StrictStr] | None = None


class DapoRow(BaseModel):
    """The DAPO schema: the problem is the prompt's last message."""
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | StrictInt | None = None
    prompt: Prompt
    reward_model: RewardModel
    data_source: StrictStr | None = None


# what a field must be, in a refusal
rules = {"problem": "a non-empty string", "answer": "a non-empty string or a finite number",
         "ground_truth": "a non-empty string or a finite number",
         "prompt": "a non-empty list of {role, content} messages with a user turn",
         "role": "system, user or assistant", "content": "a string",
         "responses": "a list of strings", "candidates": "a list of strings",
         "id": "a string or an integer", "data_source": "a string",
         "reward_model": "an object with ground_truth [and candidates]"}


def schema_error(error: ValidationError, where: str) -> UserError:
    """The first error as one line: the field's path (reward_model.ground_truth, prompt.0.role)
    and what it must be."""
    first = error.errors()[0]
    path = []
    for part in first["loc"]:
        if not (isinstance(part, int) or part in rules):
            break  # pydantic's name for a member of a union
        path.append(str(part))
    field = next(p for p in reversed(path) if not p.isdigit())
    name = ".".join(path)
    if first["type"] == "missing":
        hint = " (or use the DAPO schema: prompt + reward_model)" * (name in ("problem", "answer"))
        return UserError(f"{where}: missing '{name}'{hint}")
    if field in ("responses", "candidates"):
        return UserError(f"{where}: responses/candidates must be a list of strings")
    rule = "a {role, content} message" if path[-1].isdigit() else rules[field]
    shown = repr(first["input"])
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return UserError(f"{where}: '{name}' must be {rule}, not {shown}")
