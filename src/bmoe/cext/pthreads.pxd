# POSIX threads (the read lanes, the ranking worker) and the atomic operations the engine's
# threads share flags and counters with.

cdef extern from "pthread.h" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t * thread, void * attr, void * (*start)(void *) noexcept nogil, void * arg)
    int pthread_join(pthread_t thread, void ** retval)
    int pthread_mutex_init(pthread_mutex_t * m, void * attr)
    int pthread_mutex_destroy(pthread_mutex_t * m)
    int pthread_mutex_lock(pthread_mutex_t * m)
    int pthread_mutex_unlock(pthread_mutex_t * m)
    int pthread_cond_init(pthread_cond_t * c, void * attr)
    int pthread_cond_destroy(pthread_cond_t * c)
    int pthread_cond_wait(pthread_cond_t * c, pthread_mutex_t * m)
    int pthread_cond_broadcast(pthread_cond_t * c)
    int pthread_cond_signal(pthread_cond_t * c)

cdef extern from * nogil:
    """
    static inline int bmoe_claim(int * p) { return __sync_bool_compare_and_swap(p, 0, 1); }
    static inline void bmoe_store(int * p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int bmoe_load(int * p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline long long bmoe_fetch_add(long long * p, long long v) {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    }
    """
    int bmoe_claim(int * p)               # 0 -> 1; true for the one caller that made it
    void bmoe_store(int * p, int v)
    int bmoe_load(int * p)
    long long bmoe_fetch_add(long long * p, long long v)
