"""Bringing up Ray and the job: cluster roles, runtime environment, preflight."""
