/* The CUDA backend's streams, markers and graph-capture calls. */
#ifndef PINMEM_CUDA_STREAMS_H
#define PINMEM_CUDA_STREAMS_H

#include "backend.h"
#include "cuda_loader.h"

/* Called once, when the backend opens: fills the table's stream, marker and
 * capture entries; primary is the context of the device in use, made current
 * on pinmem's own threads. */
void pm__cuda_streams_open(const pm__cuda_api *api, CUcontext primary, pm__backend *out);

#endif
