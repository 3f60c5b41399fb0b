"""Many fits of one one-term law at once: L = E + A / x^alpha (L(N), L(C)). Torch-free.

The objective is ``fit._HuberObjective``'s exactly: in logs, theta = (e, a,
alpha) with E = exp(e), A = exp(a), log L = LSE(e, a - alpha log x), and the
summed Huber loss (delta 1e-3) between that and the observed log loss.
scipy's L-BFGS makes Python round trips on every iteration of every fit
(about 1 ms a fit of 200 points on a quiet machine), so an arm's 150 grid
starts and 100 bootstrap refits cost a quarter second or more. Here they
move together, as arrays [fits, points]: a Newton step with a backtracking
line search per iteration for every fit, in numpy; a bootstrap resample
started from the full-data optimum converges in about 10 steps.

The Huber loss is differentiable once: points with |r| < delta add J J^T to
the Hessian, the others only the curvature of the log-sum-exp, which can make
it indefinite. Where the Newton step does not lower the loss within a few
halvings, a fit takes the iteratively reweighted least-squares step instead
(weights min(1, delta / |r|): a positive definite curvature with the exact
gradient, so always a descent direction). A fit stops by L-BFGS-B's ftol
rule, when a step lowers its loss by at most ``ftol`` times max(loss, 1), or
when no step lowers it; the fits still moving after ``MAX_STEPS`` come back
unconverged, for L-BFGS to finish.

``profile_starts`` finds where to start without a grid: alpha is the law's
only nonlinear parameter, and for a fixed alpha, E and A follow from a linear
least-squares fit (of relative residuals, which approximate log residuals),
so a scan over alpha finds the basin of the optimum in one pass.

Letters in names: F fits, P points, S scanned exponents or step lengths tried.
"""

from __future__ import annotations

import numpy as np

MAX_STEPS = 100
NEWTON_HALVINGS, DESCENT_HALVINGS = 4, 30
# The exponents a profile scan tries: every 0.01 up to 3 (the grid of starts reaches 2).
SCAN_EXPONENTS = np.arange(1, 301) / 100
# Added to each curvature's diagonal, relative to its size, so that one with a
# zero direction (a resample with few distinct sizes) still solves.
RIDGE = 1e-12


def minimise(log_x_FP: np.ndarray, log_loss_FP: np.ndarray, theta_F3: np.ndarray, *, delta: float,
             ftol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise each row's summed Huber loss from ``theta_F3`` (e, a, alpha).

    ``log_x_FP`` and ``log_loss_FP`` are each fit's points (rows may repeat
    points: a bootstrap resample). Returns the optima [F, 3], their losses [F]
    and whether each converged [F].
    """
    with np.errstate(over="ignore", invalid="ignore"):  # a step out of floating range is refused, not an error
        return _minimise(log_x_FP, log_loss_FP, np.array(theta_F3, dtype=float), delta, ftol)


def _minimise(log_x_FP, log_loss_FP, theta_F3, delta, ftol):
    value_F = huber_loss(theta_F3, log_x_FP, log_loss_FP, delta)
    converged_F = np.zeros(len(theta_F3), dtype=bool)
    moving = np.arange(len(theta_F3))
    for _ in range(MAX_STEPS):
        if not len(moving):
            break
        theta, x, y, old = theta_F3[moving], log_x_FP[moving], log_loss_FP[moving], value_F[moving]
        newton, descent = _directions(theta, x, y, delta)
        theta, new = _line_search(theta, newton, x, y, old, delta, NEWTON_HALVINGS)
        retry = np.flatnonzero(new >= old)
        if len(retry):
            theta[retry], new[retry] = _line_search(theta[retry], descent[retry], x[retry], y[retry], old[retry],
                                                    delta, DESCENT_HALVINGS)
        theta_F3[moving], value_F[moving] = theta, new
        # L-BFGS-B's ftol rule: (f_old - f_new) / max(|f_old|, |f_new|, 1) <= ftol; no step lowering
        # the loss at all (at the optimum to rounding) stops a fit too
        done = old - new <= ftol * np.maximum(np.maximum(old, new), 1.0)
        converged_F[moving[done]] = True
        moving = moving[~done]
    return theta_F3, value_F, converged_F


def profile_starts(log_x_P: np.ndarray, log_loss_P: np.ndarray, *, delta: float,
                   exponents: np.ndarray = SCAN_EXPONENTS) -> np.ndarray:
    """Starts [starts, 3] for one fit: each local minimum over ``exponents``
    of the Huber loss at (E, A) fitted by least squares for that alpha
    (E held at a small positive floor where the fit puts it below; exponents
    whose A comes out negative are left out)."""
    with np.errstate(all="ignore"):  # exponents that overflow are left out below
        return _profile_starts(log_x_P, log_loss_P, delta, exponents)


def _profile_starts(log_x_P, log_loss_P, delta, exponents):
    x_SP = np.exp(-exponents[:, None] * log_x_P)  # N^-alpha
    loss_P = np.exp(log_loss_P)
    w_P = loss_P ** -2.0  # (L - loss) / loss ~ log L - log loss
    # normal equations of min sum w (E + A x - loss)^2 over (E, A), one 2x2 system per exponent
    sw, swx, swxx = w_P.sum(), x_SP @ w_P, (x_SP * x_SP) @ w_P
    swy, swxy = w_P @ loss_P, x_SP @ (w_P * loss_P)
    e_S = (swxx * swy - swx * swxy) / (sw * swxx - swx * swx)
    floor = 1e-3 * loss_P.min()
    e_S = np.maximum(e_S, floor)
    a_S = (swxy - e_S * swx) / swxx  # A given E: exact where E was not floored
    usable = np.flatnonzero(np.isfinite(e_S) & np.isfinite(a_S) & (a_S > 0))
    if not len(usable):
        return np.empty((0, 3))
    theta_S3 = np.stack([np.log(e_S[usable]), np.log(a_S[usable]), exponents[usable]], axis=1)
    value_S = huber_loss(theta_S3, np.broadcast_to(log_x_P, (len(usable), log_x_P.size)),
                         np.broadcast_to(log_loss_P, (len(usable), log_loss_P.size)), delta)
    padded = np.concatenate([[np.inf], value_S, [np.inf]])
    minima = (padded[1:-1] <= padded[:-2]) & (padded[1:-1] <= padded[2:])
    return theta_S3[minima]


def huber_loss(theta_F3: np.ndarray, log_x_FP: np.ndarray, log_loss_FP: np.ndarray, delta: float) -> np.ndarray:
    """Each fit's summed Huber loss [F] at ``theta_F3``."""
    residual_FP = _log_law(theta_F3, log_x_FP)[1] - log_loss_FP
    slope_FP = np.clip(residual_FP, -delta, delta)
    return np.sum(slope_FP * (residual_FP - 0.5 * slope_FP), axis=1)


def _log_law(theta_F3: np.ndarray, log_x_FP: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The power-law term a - alpha log x and log L = LSE(e, that), each [F, P]."""
    term_FP = theta_F3[:, 1:2] - theta_F3[:, 2:3] * log_x_FP
    return term_FP, np.logaddexp(theta_F3[:, :1], term_FP)


def _directions(theta_F3, log_x_FP, log_loss_FP, delta) -> tuple[np.ndarray, np.ndarray]:
    """The Newton step and the reweighted least-squares step of each fit, each [F, 3]."""
    term_FP, log_law_FP = _log_law(theta_F3, log_x_FP)
    residual_FP = log_law_FP - log_loss_FP
    slope_FP = np.clip(residual_FP, -delta, delta)
    share_FP = np.exp(term_FP - log_law_FP)  # softmax weight of the power-law term
    rest_FP = 1.0 - share_FP
    jacobian_F3P = np.stack([rest_FP, share_FP, -share_FP * log_x_FP], axis=1)  # d log L / d theta
    gradient_F3 = (jacobian_F3P @ slope_FP[..., None])[..., 0]
    weight_FP = np.divide(slope_FP, residual_FP, out=np.ones_like(residual_FP), where=residual_FP != 0)
    majoriser_F33 = (jacobian_F3P * weight_FP[:, None]) @ jacobian_F3P.transpose(0, 2, 1)
    descent = _solve(majoriser_F33, -gradient_F3)
    inside_FP = (np.abs(residual_FP) < delta).astype(float)
    # LSE's Hessian is rest * share * v v^T with v = d(e - term) / d theta = (1, -1, log x)
    v_F3P = np.stack([np.ones_like(log_x_FP), -np.ones_like(log_x_FP), log_x_FP], axis=1)
    hessian_F33 = ((jacobian_F3P * inside_FP[:, None]) @ jacobian_F3P.transpose(0, 2, 1)
                   + (v_F3P * (slope_FP * rest_FP * share_FP)[:, None]) @ v_F3P.transpose(0, 2, 1))
    newton = _solve(hessian_F33, -gradient_F3)
    uphill = ~np.isfinite(newton).all(axis=1) | (np.sum(newton * gradient_F3, axis=1) >= 0)
    newton[uphill] = descent[uphill]
    return newton, descent


def _solve(matrix_F33: np.ndarray, vector_F3: np.ndarray) -> np.ndarray:
    """matrix^-1 vector for each fit, the diagonal raised by ``RIDGE`` of its size."""
    size_F = np.abs(np.diagonal(matrix_F33, axis1=1, axis2=2)).max(axis=1)
    matrix_F33 = matrix_F33 + (RIDGE * size_F + np.finfo(float).tiny)[:, None, None] * np.eye(3)
    with np.errstate(all="ignore"):
        try:
            return np.linalg.solve(matrix_F33, vector_F3[..., None])[..., 0]
        except np.linalg.LinAlgError:  # one exactly singular matrix fails the whole batch
            return (np.linalg.pinv(matrix_F33) @ vector_F3[..., None])[..., 0]


def _line_search(theta_F3, step_F3, log_x_FP, log_loss_FP, old_F, delta, halvings) -> tuple[np.ndarray, np.ndarray]:
    """The longest of step, step / 2, ... (``halvings`` tries) that lowers each
    fit's loss below ``old_F``; fits none lowers keep their theta and loss.
    Tries go in rounds of 1, 2, 4, ... at once, each round for the fits still without a step."""
    theta, value = theta_F3.copy(), old_F.copy()
    pending, tried, count = np.arange(len(theta_F3)), 0, 1
    while len(pending) and tried < halvings:
        count = min(count, halvings - tried)
        scale_S = 0.5 ** np.arange(tried, tried + count)
        trial_FS3 = theta_F3[pending, None] + scale_S[:, None] * step_F3[pending, None]
        value_FS = huber_loss(trial_FS3.reshape(-1, 3), np.repeat(log_x_FP[pending], count, axis=0),
                              np.repeat(log_loss_FP[pending], count, axis=0), delta).reshape(len(pending), count)
        lower_FS = value_FS < old_F[pending, None]  # False where NaN: a step out of floating range
        first_F = np.argmax(lower_FS, axis=1)
        found = np.flatnonzero(lower_FS[np.arange(len(pending)), first_F])
        theta[pending[found]] = trial_FS3[found, first_F[found]]
        value[pending[found]] = value_FS[found, first_F[found]]
        pending = np.delete(pending, found)
        tried, count = tried + count, 2 * count
    return theta, value
