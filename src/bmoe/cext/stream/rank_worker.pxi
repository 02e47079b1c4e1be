# The ranking worker: a thread that makes a decode layer's rankings while the eval thread
# serves that layer's load. The eval thread waits for them before it issues their reads,
# the point it would issue them without the worker: timing never changes a decision
# (``bmoe.domain.streaming.rank_worker`` says when it runs).
#
# Owns: ``routing_t.w_*``, the worker thread. Calls: routing (``make_ranking``,
# ``rank_targets``). Locks: ``r.w_mu``; waits on ``r.w_cv``.

cdef void * rank_worker_main(void * arg) noexcept nogil:
    """Make the rankings the eval thread asks for (``w_targets``), on its layer's router
    input ``r.x`` (valid until the eval thread, which waits for them, leaves the callback)."""
    cdef stream_t * s = <stream_t *> arg
    cdef routing_t * r = &s.r
    cdef int j, n
    cdef int targets[MAX_TARGETS]
    cdef double t0
    pthread_mutex_lock(&r.w_mu)
    while True:
        while not r.w_stop and r.w_pending == 0:
            pthread_cond_wait(&r.w_cv, &r.w_mu)
        if r.w_stop:
            break
        n = r.w_n
        for j in range(n):
            targets[j] = r.w_targets[j]
        pthread_mutex_unlock(&r.w_mu)
        t0 = now()
        for j in range(n):
            make_ranking(s, targets[j])
        t0 = now() - t0
        pthread_mutex_lock(&r.w_mu)
        r.rank_s += t0
        r.w_pending = 0
        pthread_cond_broadcast(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    return NULL


cdef int start_rank_worker(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    if r.w_started:
        return 0
    pthread_mutex_init(&r.w_mu, NULL)
    pthread_cond_init(&r.w_cv, NULL)
    r.w_stop = 0
    r.w_pending = 0
    if pthread_create(&r.w_thread, NULL, rank_worker_main, <void *> s) != 0:
        pthread_cond_destroy(&r.w_cv)
        pthread_mutex_destroy(&r.w_mu)
        return -1
    r.w_started = 1
    return 0


cdef void stop_rank_worker(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    if not r.w_started:
        return
    pthread_mutex_lock(&r.w_mu)
    r.w_stop = 1
    pthread_cond_broadcast(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    pthread_join(r.w_thread, NULL)
    pthread_cond_destroy(&r.w_cv)
    pthread_mutex_destroy(&r.w_mu)
    r.w_started = 0


cdef bint ask_rankings(stream_t * s, int layer) noexcept nogil:
    """Hand this layer's rankings to the worker (before its load); False when it does not
    run or there is nothing to rank (``rank_ahead`` then ranks on this thread)."""
    cdef routing_t * r = &s.r
    cdef int committed[MAX_TARGETS]
    if not (r.w_started and r.use_worker) or r.x == NULL or r.disarmed:
        return False
    pthread_mutex_lock(&r.w_mu)
    r.w_n = rank_targets(s, layer, r.w_targets, committed)
    r.w_pending = 1 if r.w_n > 0 else 0
    if r.w_pending:
        pthread_cond_signal(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    return r.w_n > 0


cdef void await_rankings(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    cdef double t0 = now()
    pthread_mutex_lock(&r.w_mu)
    while r.w_pending:
        pthread_cond_wait(&r.w_cv, &r.w_mu)
    pthread_mutex_unlock(&r.w_mu)
    r.rank_wait_s += now() - t0
