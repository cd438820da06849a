"""Operations: the control socket, status, metrics (counters and Prometheus), logs and memory."""
