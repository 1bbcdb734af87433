"""Fits the rational approximation of erf that `backend_support.exact_gelu`
evaluates under JAX, and prints its coefficients and error.

    erf(z) ≈ z · P(z²) / Q(z²)   on 0 ≤ z ≤ 4,   P, Q of degree 5, Q(0) = 1

(erf is odd, and 1 − erf(4) = 1.5e-8 is below float32's resolution at 1, so
beyond 4 the function is ±1.) The fit is a least-squares fit of the
linearised residual z·P(t) − erf(z)·Q(t) on 20,000 points, reweighted
by 1/Q² of the previous iteration (Loeb's method, so the residual
approximates the true error) and by the previous error (Lawson's method,
which drives the fit towards the minimax error).

    python scripts/fit_erf_coefficients.py
"""

import math

import numpy as np

DEGREE = 5
BOUND = 4.0
ITERATIONS = 60


def fit(degree=DEGREE, bound=BOUND, iterations=ITERATIONS):
    """`(P, Q, max_error)`: coefficients in increasing powers of z², and
    the largest error in float64 on the fitting grid."""
    z = np.linspace(0.0, bound, 20001)[1:]
    t = z * z
    erf = np.array([math.erf(value) for value in z])
    powers = t[:, None] ** np.arange(degree + 1)
    design = np.concatenate([z[:, None] * powers, -erf[:, None] * powers[:, 1:]], axis=1)
    loeb, lawson = np.ones_like(z), np.ones_like(z)
    for _ in range(iterations):
        weights = np.sqrt(loeb * lawson)
        coefficients = np.linalg.lstsq(design * weights[:, None], erf * weights, rcond=None)[0]
        numerator, denominator = coefficients[: degree + 1], np.concatenate([[1.0], coefficients[degree + 1 :]])
        q = powers @ denominator
        error = np.abs(z * (powers @ numerator) / q - erf)
        loeb = 1.0 / q**2
        lawson = np.maximum(lawson * error / np.mean(lawson * error), 1e-12)
    return numerator, denominator, error.max()


if __name__ == "__main__":
    numerator, denominator, max_error = fit()
    print("P =", [float(c) for c in numerator])
    print("Q =", [float(c) for c in denominator])
    print(f"largest error on [0, {BOUND}] in float64: {max_error:.2e}")
