"""`deepspeed.runtime.zero.muon.muon_optimizer`: the optimizer the config's "Muon" builds."""

from zerostream.ops.muon import MuonWithAuxAdam

__all__ = ["MuonWithAuxAdam"]
