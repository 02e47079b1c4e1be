# Declarations of the parts of ggml.h that bmoe's C callbacks read.
# The header is the one llama-cpp-python installs (site-packages/include/ggml.h),
# so the struct layout always matches the library that is loaded.

from libc.stdint cimport int32_t, int64_t


cdef extern from "stdbool.h":
    ctypedef bint bool


cdef extern from "ggml.h" nogil:
    enum:
        GGML_MAX_DIMS
        GGML_MAX_SRC
        GGML_MAX_NAME

    enum ggml_type:
        GGML_TYPE_F32
        GGML_TYPE_F16
        GGML_TYPE_I32

    enum ggml_op:
        GGML_OP_NONE
        GGML_OP_MUL_MAT
        GGML_OP_MUL_MAT_ID
        GGML_OP_ARGSORT
        GGML_OP_VIEW
        GGML_OP_GET_ROWS
        GGML_OP_ADD_ID

    struct ggml_tensor:
        ggml_type type
        void * buffer        # struct ggml_backend_buffer *
        int64_t ne[4]
        size_t nb[4]
        ggml_op op
        ggml_tensor * src[10]
        ggml_tensor * view_src
        size_t view_offs
        void * data
        char name[64]
        void * extra         # the buffer type's per-tensor state (CPU_REPACK: its repack traits)

    struct ggml_init_params:
        size_t mem_size
        void * mem_buffer
        bool no_alloc
