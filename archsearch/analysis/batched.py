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
# L(N, D)'s pairs (alpha, beta): every 0.02 up to 3 each, 22,500 pairs.
SCAN_EXPONENTS_2D = np.arange(1, 151) / 50
# The most elements [fits, terms, points] one batch holds (32 MiB an array): more fits go in turns,
# so a fit of a million points keeps its memory bounded.
CHUNK = 2**22
# Added to each curvature's diagonal, relative to its size, so that one with a
# zero direction (a resample with few distinct sizes) still solves.
RIDGE = 1e-12


def minimise(log_x_FP: np.ndarray, log_loss_FP: np.ndarray, theta_FQ: np.ndarray, *, delta: float,
             ftol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise each row's summed Huber loss from ``theta_FQ``.

    ``log_x_FP`` holds each fit's log variable [F, P] for a one-term law, or
    its K log variables [F, K, P] (L(N, D): K = 2); ``log_loss_FP`` each
    fit's log losses [F, P] (rows may repeat points: a bootstrap resample).
    ``theta_FQ`` is (e, a_1..a_K, alpha_1..alpha_K), Q = 1 + 2K. Returns the
    optima [F, Q], their losses [F] and whether each converged [F].
    """
    log_x_FKP, theta_FQ = _with_terms(log_x_FP), np.array(theta_FQ, dtype=float)
    per_turn = max(1, CHUNK // max(1, log_x_FKP.shape[1] * log_x_FKP.shape[2]))
    turns = []
    with np.errstate(over="ignore", invalid="ignore"):  # a step out of floating range is refused, not an error
        for first in range(0, len(theta_FQ), per_turn):
            rows = slice(first, first + per_turn)
            turns.append(_minimise(log_x_FKP[rows], log_loss_FP[rows], theta_FQ[rows], delta, ftol))
    if not turns:  # no fits (a fit without a bootstrap)
        return theta_FQ, np.empty(0), np.empty(0, dtype=bool)
    return tuple(np.concatenate(parts) for parts in zip(*turns))


def _with_terms(log_x: np.ndarray) -> np.ndarray:
    """[F, P] -> [F, 1, P]; [F, K, P] as it is."""
    return log_x[:, None, :] if log_x.ndim == 2 else log_x


def _minimise(log_x_FKP, log_loss_FP, theta_FQ, delta, ftol):
    value_F = _huber_loss(theta_FQ, log_x_FKP, log_loss_FP, delta)
    converged_F = np.zeros(len(theta_FQ), dtype=bool)
    moving = np.arange(len(theta_FQ))
    for _ in range(MAX_STEPS):
        if not len(moving):
            break
        theta, x, y, old = theta_FQ[moving], log_x_FKP[moving], log_loss_FP[moving], value_F[moving]
        newton, descent = _directions(theta, x, y, delta)
        theta, new = _line_search(theta, newton, x, y, old, delta, NEWTON_HALVINGS)
        retry = np.flatnonzero(new >= old)
        if len(retry):
            theta[retry], new[retry] = _line_search(theta[retry], descent[retry], x[retry], y[retry], old[retry],
                                                    delta, DESCENT_HALVINGS)
        theta_FQ[moving], value_F[moving] = theta, new
        # L-BFGS-B's ftol rule: (f_old - f_new) / max(|f_old|, |f_new|, 1) <= ftol; no step lowering
        # the loss at all (at the optimum to rounding) stops a fit too
        done = old - new <= ftol * np.maximum(np.maximum(old, new), 1.0)
        converged_F[moving[done]] = True
        moving = moving[~done]
    return theta_FQ, value_F, converged_F


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


def profile_starts_2d(log_x_2P: np.ndarray, log_loss_P: np.ndarray, *, delta: float,
                      exponents: np.ndarray = SCAN_EXPONENTS_2D) -> np.ndarray:
    """Starts [starts, 5] for one L(N, D) fit: ``profile_starts`` over pairs
    (alpha, beta) from ``exponents`` x ``exponents``, with (E, A, B) fitted
    by least squares for each pair; each local minimum of the Huber loss
    over the pairs (lower than or equal to its four neighbours) is a start."""
    with np.errstate(all="ignore"):  # pairs that overflow are left out below
        return _profile_starts_2d(log_x_2P, log_loss_P, delta, exponents)


def _profile_starts_2d(log_x_2P, log_loss_P, delta, exponents):
    s = len(exponents)
    n_SP = np.exp(-exponents[:, None] * log_x_2P[0])  # N^-alpha
    d_SP = np.exp(-exponents[:, None] * log_x_2P[1])  # D^-beta
    loss_P = np.exp(log_loss_P)
    w_P = loss_P ** -2.0  # (L - loss) / loss ~ log L - log loss
    # normal equations of min sum w (E + A n + B d - loss)^2 over (E, A, B), one 3x3 system per pair
    sw, swn, swd = w_P.sum(), n_SP @ w_P, d_SP @ w_P
    swnn, swdd, swnd = (n_SP * n_SP) @ w_P, (d_SP * d_SP) @ w_P, (n_SP * w_P) @ d_SP.T  # [S], [S], [S, S]
    swy, swny, swdy = w_P @ loss_P, n_SP @ (w_P * loss_P), d_SP @ (w_P * loss_P)
    ones = np.ones((s, s))
    normal_SS33 = np.stack([np.stack([sw * ones, swn[:, None] * ones, swd[None, :] * ones], -1),
                            np.stack([swn[:, None] * ones, swnn[:, None] * ones, swnd], -1),
                            np.stack([swd[None, :] * ones, swnd, swdd[None, :] * ones], -1)], -2)
    target_SS3 = np.stack([swy * ones, swny[:, None] * ones, swdy[None, :] * ones], -1)
    coefficients_SS3 = _solve_normal(normal_SS33, target_SS3)
    floor = 1e-3 * loss_P.min()
    floored = ~(coefficients_SS3[..., 0] >= floor)  # NaN too: solved again with E at the floor
    if floored.any():
        rest = target_SS3[floored, 1:] - floor * normal_SS33[floored, 1:, 0]
        coefficients_SS3[floored, 0] = floor
        coefficients_SS3[floored, 1:] = _solve_normal(normal_SS33[floored, 1:, 1:], rest)
    usable_SS = np.isfinite(coefficients_SS3).all(-1) & (coefficients_SS3[..., 1:] > 0).all(-1)
    alpha_SS, beta_SS = np.meshgrid(exponents, exponents, indexing="ij")
    theta_SS5 = np.stack([*np.log(np.where(usable_SS[..., None], coefficients_SS3, 1.0)).transpose(2, 0, 1),
                          alpha_SS, beta_SS], axis=-1)
    e_SS, a_SS, b_SS = (np.where(usable_SS, coefficients_SS3[..., i], np.nan) for i in range(3))
    value_SS = np.empty((s, s))
    per_turn = max(1, CHUNK // (s * log_loss_P.size))  # alphas at a time
    for first in range(0, s, per_turn):
        alphas = slice(first, first + per_turn)
        # the law for these pairs at every point, [S, S, P]: in natural form, since each term is at hand
        law_SSP = e_SS[alphas, :, None] + a_SS[alphas, :, None] * n_SP[alphas, None] + b_SS[alphas, :, None] * d_SP[None]
        residual_SSP = np.log(law_SSP) - log_loss_P
        slope_SSP = np.clip(residual_SSP, -delta, delta)
        value_SS[alphas] = np.sum(slope_SSP * (residual_SSP - 0.5 * slope_SSP), axis=-1)
    value_SS = np.nan_to_num(value_SS, nan=np.inf)
    padded = np.pad(value_SS, 1, constant_values=np.inf)
    minima_SS = usable_SS & np.isfinite(value_SS)
    for shifted in (padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]):
        minima_SS &= value_SS <= shifted
    return theta_SS5[minima_SS]


def _solve_normal(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix^-1 vector over leading axes; NaN where a system is singular."""
    try:
        return np.linalg.solve(matrix, vector[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return (np.linalg.pinv(matrix) @ vector[..., None])[..., 0]


def huber_loss(theta_FQ: np.ndarray, log_x_FP: np.ndarray, log_loss_FP: np.ndarray, delta: float) -> np.ndarray:
    """Each fit's summed Huber loss [F] at ``theta_FQ`` (shapes as in ``minimise``)."""
    return _huber_loss(theta_FQ, _with_terms(log_x_FP), log_loss_FP, delta)


def _huber_loss(theta_FQ, log_x_FKP, log_loss_FP, delta):
    residual_FP = _log_law(theta_FQ, log_x_FKP)[1] - log_loss_FP
    slope_FP = np.clip(residual_FP, -delta, delta)
    return np.sum(slope_FP * (residual_FP - 0.5 * slope_FP), axis=1)


def _log_law(theta_FQ: np.ndarray, log_x_FKP: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The law's terms (e, then a_k - alpha_k log x_k) [F, 1 + K, P] and log L = their LSE [F, P]."""
    k = log_x_FKP.shape[1]
    power_FKP = theta_FQ[:, 1:1 + k, None] - theta_FQ[:, 1 + k:, None] * log_x_FKP
    if k == 1:  # the one-term laws: logaddexp, a third faster than the general LSE
        log_law_FP = np.logaddexp(theta_FQ[:, :1], power_FKP[:, 0])
    else:
        top_FP = np.maximum(theta_FQ[:, :1], power_FKP.max(axis=1))
        log_law_FP = top_FP + np.log(np.exp(theta_FQ[:, :1] - top_FP) + np.exp(power_FKP - top_FP[:, None]).sum(axis=1))
    return power_FKP, log_law_FP


def _directions(theta_FQ, log_x_FKP, log_loss_FP, delta) -> tuple[np.ndarray, np.ndarray]:
    """The Newton step and the reweighted least-squares step of each fit, each [F, Q]."""
    gradient_FQ, majoriser_FQQ, hessian_FQQ = _curvature(theta_FQ, log_x_FKP, log_loss_FP, delta)
    descent = _solve(majoriser_FQQ, -gradient_FQ)
    newton = _solve(hessian_FQQ, -gradient_FQ)
    uphill = ~np.isfinite(newton).all(axis=1) | (np.sum(newton * gradient_FQ, axis=1) >= 0)
    newton[uphill] = descent[uphill]
    return newton, descent


def _curvature(theta_FQ, log_x_FKP, log_loss_FP, delta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each fit's gradient [F, Q], the reweighted least-squares curvature and the Hessian [F, Q, Q]."""
    k = log_x_FKP.shape[1]
    power_FKP, log_law_FP = _log_law(theta_FQ, log_x_FKP)
    residual_FP = log_law_FP - log_loss_FP
    slope_FP = np.clip(residual_FP, -delta, delta)
    share_FKP = np.exp(power_FKP - log_law_FP[:, None])  # softmax weight of each power-law term
    rest_FP = 1.0 - share_FKP.sum(axis=1)  # and of e
    jacobian_FQP = np.concatenate([rest_FP[:, None], share_FKP, -share_FKP * log_x_FKP], axis=1)  # d log L / d theta
    jacobian_FPQ = jacobian_FQP.transpose(0, 2, 1)
    gradient_FQ = (jacobian_FQP @ slope_FP[..., None])[..., 0]
    weight_FP = np.divide(slope_FP, residual_FP, out=np.ones_like(residual_FP), where=residual_FP != 0)
    majoriser_FQQ = (jacobian_FQP * weight_FP[:, None]) @ jacobian_FPQ
    inside_FP = (np.abs(residual_FP) < delta).astype(float)
    # Per point, LSE's Hessian in theta is G^T diag(s) G - J J^T, with s the softmax weights,
    # G the terms' derivatives in theta (e; a_k - alpha_k log x_k) and J = G^T s the Jacobian.
    # Summed with the slopes as weights, and Huber's own J J^T inside delta:
    hessian_FQQ = (jacobian_FQP * (inside_FP - slope_FP)[:, None]) @ jacobian_FPQ
    weighted_FKP = share_FKP * slope_FP[:, None]
    rows = np.arange(1 + 2 * k)
    coefficients, exponents = rows[1:1 + k], rows[1 + k:]
    hessian_FQQ[:, 0, 0] += np.sum(rest_FP * slope_FP, axis=1)
    hessian_FQQ[:, coefficients, coefficients] += weighted_FKP.sum(axis=2)
    hessian_FQQ[:, exponents, exponents] += (weighted_FKP * log_x_FKP**2).sum(axis=2)
    cross_FK = -(weighted_FKP * log_x_FKP).sum(axis=2)  # d2 / (d a_k d alpha_k)
    hessian_FQQ[:, coefficients, exponents] += cross_FK
    hessian_FQQ[:, exponents, coefficients] += cross_FK
    return gradient_FQ, majoriser_FQQ, hessian_FQQ


def _solve(matrix_FQQ: np.ndarray, vector_FQ: np.ndarray) -> np.ndarray:
    """matrix^-1 vector for each fit, the diagonal raised by ``RIDGE`` of its size."""
    size_F = np.abs(np.diagonal(matrix_FQQ, axis1=1, axis2=2)).max(axis=1)
    matrix_FQQ = matrix_FQQ + (RIDGE * size_F + np.finfo(float).tiny)[:, None, None] * np.eye(matrix_FQQ.shape[1])
    with np.errstate(all="ignore"):
        try:
            return np.linalg.solve(matrix_FQQ, vector_FQ[..., None])[..., 0]
        except np.linalg.LinAlgError:  # one exactly singular matrix fails the whole batch
            return (np.linalg.pinv(matrix_FQQ) @ vector_FQ[..., None])[..., 0]


def _line_search(theta_FQ, step_FQ, log_x_FKP, log_loss_FP, old_F, delta, halvings) -> tuple[np.ndarray, np.ndarray]:
    """The longest of step, step / 2, ... (``halvings`` tries) that lowers each
    fit's loss below ``old_F``; fits none lowers keep their theta and loss.
    Tries go in rounds of 1, 2, 4, ... at once, each round for the fits still without a step."""
    theta, value = theta_FQ.copy(), old_F.copy()
    pending, tried, count = np.arange(len(theta_FQ)), 0, 1
    while len(pending) and tried < halvings:
        count = min(count, halvings - tried)
        scale_S = 0.5 ** np.arange(tried, tried + count)
        trial_FSQ = theta_FQ[pending, None] + scale_S[:, None] * step_FQ[pending, None]
        value_FS = _huber_loss(trial_FSQ.reshape(-1, theta_FQ.shape[1]), np.repeat(log_x_FKP[pending], count, axis=0),
                               np.repeat(log_loss_FP[pending], count, axis=0), delta).reshape(len(pending), count)
        lower_FS = value_FS < old_F[pending, None]  # False where NaN: a step out of floating range
        first_F = np.argmax(lower_FS, axis=1)
        found = np.flatnonzero(lower_FS[np.arange(len(pending)), first_F])
        theta[pending[found]] = trial_FSQ[found, first_F[found]]
        value[pending[found]] = value_FS[found, first_F[found]]
        pending = np.delete(pending, found)
        tried, count = tried + count, 2 * count
    return theta, value
