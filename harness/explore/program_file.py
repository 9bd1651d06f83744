"""A program as a file: reading back what :meth:`Program.to_json` wrote (harness.explore.program_model),
and refusing what ProgramMachine could not have written.  A found file is input, not trusted:
it may start no process with its own settings and load no code, every wait in it is bounded,
and an injected message is bounded bytes to a role's control socket."""

from __future__ import annotations

import json

import msgspec

from harness.explore.program_model import (AFTER_KILL, LOSS_KINDS, MAX_INJECTIONS, MAX_MESSAGE_BYTES,
                                           MAX_MESSAGE_FRAMES, PROFILES, Program)
from harness.spec.steps import (Abort, AwaitStatus, Clear, EngineFaults, FreezeRole, InitSender, InjectFrames, KillRole,
                                LoseMessages, OpenRoom, RequestKV, RestartRole, SendChunk, Sleep, StartRoles, ThawRole,
                                VerifyPools)

#: the steps a program may hold: what ProgramMachine writes, nothing that starts processes
#: with a file's settings or loads code, and no kill but of the program's own prefill or decode
#: (an injected message is bytes to a role's control socket, bounded by _check_bounds)
PROGRAM_STEPS = (StartRoles, OpenRoom, RequestKV, AwaitStatus, InitSender, SendChunk, Abort, Clear, Sleep, VerifyPools,
                 EngineFaults, FreezeRole, ThawRole, RestartRole, InjectFrames, KillRole, LoseMessages)
MAX_WAIT_S = 30.0  # the longest Sleep or status bound a program file may ask for (seconds)
STEP_TYPES = {kind.__name__: kind for kind in PROGRAM_STEPS}


def program_from_json(text: str) -> Program:
    """The program :meth:`Program.to_json` wrote.  ValueError on anything else: a step
    outside :data:`PROGRAM_STEPS`, a field of the wrong type, a StartRoles other than a
    :data:`PROFILES` one, a wait beyond :data:`MAX_WAIT_S`, a role left frozen, more than
    one kill."""
    try:
        doc = json.loads(text)
        steps = []
        for raw in doc["steps"]:
            kind = STEP_TYPES.get(raw.pop("step"))
            if kind is None:
                raise ValueError("a step a generated program never holds")
            steps.append(msgspec.json.decode(json.dumps(raw), type=kind))
        lifecycles = tuple((str(x[0]), bool(x[1]), *(bool(v) for v in x[2:3]), *(_after_kill(v) for v in x[3:4]),
                            *(bool(v) for v in x[4:5])) for x in doc["lifecycles"])
        program = Program(tuple(steps), lifecycles, str(doc.get("topology", "p1-d1")))
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, RecursionError) as exc:  # msgspec: ValueErrors
        raise ValueError(f"not a pdconform program: {type(exc).__name__}: {exc}") from exc
    _check_bounds(program)
    return program


def _after_kill(value) -> str:
    if value not in AFTER_KILL:
        raise ValueError(f"a lifecycle's after-kill mark {value!r} (one of {', '.join(map(repr, AFTER_KILL))})")
    return value


def _check_bounds(program: Program) -> None:
    """ValueError unless ``program`` is one ProgramMachine could have written: a profile's
    StartRoles first and only there; every wait bounded; every role a step names one it started
    and, after a kill, not the dead one; engine faults and restarts only of a prefill, bounded, of
    the kinds a program sets; one kill or one restart at most, never while a role is frozen;
    every frozen role thawed."""
    if not program.steps or program.steps[0] not in PROFILES.values():
        raise ValueError("not a pdconform program: it must start with the program roles, unchanged")
    prefills = program.steps[0].prefills
    # the roles each kind of field may name: the ones the profile starts
    kinds = {"role": (*prefills, *program.steps[0].decodes), "prefill": prefills, "decode": program.steps[0].decodes}
    frozen: set[str] = set()
    kills, dead = 0, ""
    if sum(isinstance(step, InjectFrames) for step in program.steps) > MAX_INJECTIONS:
        raise ValueError(f"not a pdconform program: more than {MAX_INJECTIONS} injected messages")
    for step in program.steps[1:]:
        if isinstance(step, StartRoles):
            raise ValueError("not a pdconform program: roles started twice")
        named = {field: getattr(step, field) for field in ("role", "prefill", "decode") if hasattr(step, field)}
        if any(name not in kinds[field] or name == dead for field, name in named.items()):
            raise ValueError("not a pdconform program: a step names a role the program did not start, or a dead one")
        wait = step.seconds if isinstance(step, Sleep) else getattr(step, "timeout_s", 0.0)
        wait = step.settle_s if isinstance(step, VerifyPools) else wait
        if isinstance(step, EngineFaults):
            wait = max(step.delay_s, step.aux_delay_s)
            if step.role not in prefills or step.fail_group is not None or not 0 < (step.fail_nth or 1) <= 100:
                raise ValueError("not a pdconform program: an engine fault a program never sets")
        if not 0 <= wait <= MAX_WAIT_S:
            raise ValueError(f"not a pdconform program: a wait of {wait} s (0 to {MAX_WAIT_S:.0f} s)")
        if isinstance(step, LoseMessages) and (step.kind not in LOSS_KINDS or step.room is None or step.count != 0):
            raise ValueError("not a pdconform program: a message loss a program never sets")
        if isinstance(step, InjectFrames) and (
                len(step.frames) != 1 or not 0 < len(step.frames[0]) <= MAX_MESSAGE_FRAMES
                or sum(map(len, step.frames[0])) > MAX_MESSAGE_BYTES):
            raise ValueError("not a pdconform program: an injected message a program never sends")
        if isinstance(step, KillRole) and (frozen or kills):
            raise ValueError("not a pdconform program: a kill a program never makes")
        kills += isinstance(step, (KillRole, RestartRole))  # a program kills or restarts a role once, never both
        dead = step.role if isinstance(step, KillRole) else dead
        if isinstance(step, RestartRole) and (step.role not in prefills or step.env is not None or frozen or kills > 1):
            raise ValueError("not a pdconform program: a restart a program never makes")
        if isinstance(step, (FreezeRole, ThawRole)):
            if (step.role in frozen) != isinstance(step, ThawRole):
                raise ValueError("not a pdconform program: a freeze and a thaw out of pairs")
            frozen ^= {step.role}
    if frozen:
        raise ValueError("not a pdconform program: a role is left frozen")


__all__ = ["MAX_WAIT_S", "PROGRAM_STEPS", "program_from_json"]
