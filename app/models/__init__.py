"""Types only: cluster snapshot, network endpoints and verdicts, job groups, decisions. No I/O."""
