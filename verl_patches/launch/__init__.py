"""Bringing up Ray and the job: cluster roles, the job's environment, preflight."""
