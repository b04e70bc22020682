"""A ZeRO engine's whole training state, gathered through the public accessors, for tests
that compare two runs bit for bit: each param's fp32 master, the named optimizer states and
its 16-bit value."""


def full_state(engine, states=("exp_avg_sq",)) -> dict:
    from zerostream.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from zerostream.zero import GatheredParameters

    out = {}
    for name, p in engine.module.named_parameters():
        out["fp32." + name] = safe_get_full_fp32_param(p).clone()
        for key in states:
            out[f"{key}.{name}"] = safe_get_full_optimizer_state(p, key).clone()
    with GatheredParameters(list(engine.module.parameters())):
        for name, p in engine.module.named_parameters():
            out["16bit." + name] = p.detach().float().clone()
    return out
