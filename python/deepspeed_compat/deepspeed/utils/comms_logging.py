"""`deepspeed.utils.comms_logging`: the comms logger (zerostream/comms_logging.py); the
process's instance is `deepspeed.comm.comms_logger`."""

from zerostream.comm.comms_logging import CommsLogger, calc_bw_log, convert_size

__all__ = ["CommsLogger", "calc_bw_log", "convert_size"]
