"""`deepspeed.runtime.zero.muon`: DeepSpeed's Muon optimizer, which is zerostream's
(`zerostream.ops.muon`)."""
