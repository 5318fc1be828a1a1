"""A data row's schema, checked by pydantic (checked_row): what each field must be, how long a
row's text may be, and a refusal that names the file, the row and the field. Imported only where
rows are read (machinery/data.py): a script that reads no file (benchmarks/bench_trainer.py on a
GPU image without pydantic) never needs it."""
import reprlib
from typing import Annotated, Literal

from pydantic import (AfterValidator, AllowInfNan, BaseModel, Field, StrictFloat, StrictInt,
                      StrictStr, ValidationError)

from machinery import UserError

# A row's fields, checked by pydantic (strict: no bool for a number, no number for a text): a
# refusal names the file, the row and the field, with what the field must be (rules). Keys of
# no field (a DAPO row's ability, extra_info) are ignored, pydantic's default: they are not read.
Text = Annotated[StrictStr, Field(pattern=r"\S")]
Answer = Text | StrictInt | Annotated[StrictFloat, AllowInfNan(False)]


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: StrictStr


def has_user_turn(messages: list) -> list:
    """A prompt needs a user turn that says something: an empty list has none."""
    if not any(m.role == "user" and m.content.strip() for m in messages):
        raise ValueError("no user turn")
    return messages


Prompt = Annotated[list[Message], AfterValidator(has_user_turn)]


class Row(BaseModel):
    """Our keys."""
    id: StrictStr | StrictInt | None = None
    problem: Text
    answer: Answer
    prompt: Prompt | None = None  # chat messages, the template not used
    responses: list[StrictStr] | None = None  # a pool's verified answers
    data_source: StrictStr | None = None  # validation reports accuracy per source


class RewardModel(BaseModel):
    ground_truth: Answer
    candidates: list[StrictStr] | None = None


class DapoRow(BaseModel):
    """The DAPO schema: the problem is the prompt's last message."""
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
    # pydantic's location less its names for a union's members (answer's 'constrained-str')
    path = [part for part in first["loc"] if isinstance(part, int) or part in rules]
    name = ".".join(map(str, path))
    if first["type"] == "missing":
        hint = " (or use the DAPO schema: prompt + reward_model)" * (name in ("problem", "answer"))
        return UserError(f"{where}: missing '{name}'{hint}")
    if "responses" in path or "candidates" in path:
        return UserError(f"{where}: responses/candidates must be a list of strings")
    # a list's member (prompt.0): the other lists are of strings, named above
    rule = rules.get(path[-1], "a {role, content} message")
    # the value as reprlib shows it: a long text or list cut short, with "..."
    return UserError(f"{where}: '{name}' must be {rule}, not {reprlib.repr(first['input'])}")


# a row's text, at most: a prompt is cut to --max_prompt_len tokens anyway; the tokenizer takes
# seconds a million characters and aborts the process on 50 MB
max_text = 1_000_000


def checked_row(raw, where: str):
    """A DAPO row or {"problem", "answer" [, "prompt", "responses", "data_source"]}, checked by
    its schema and its length, as a Row (our keys)."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    try:
        if "reward_model" in raw:
            dapo = DapoRow.model_validate(raw)
            row = Row(id=dapo.id, problem=dapo.prompt[-1].content, prompt=dapo.prompt,
                      answer=dapo.reward_model.ground_truth, data_source=dapo.data_source,
                      responses=dapo.reward_model.candidates)
        else:
            row = Row.model_validate(raw)
    except ValidationError as e:
        raise schema_error(e, where) from None
    length = len(row.problem) + sum(len(m.content) for m in row.prompt or [])
    if length > max_text:
        raise UserError(f"{where}: its problem and prompt hold {length:,} characters, over "
                        f"{max_text:,} (the tokenizer would abort on tens of millions)")
    return row
