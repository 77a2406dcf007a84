/* The copy engine's counters (pm_copy_get_stats): each way a copy goes adds
 * its bytes and times here. A file of their own, below every file that
 * counts, so that counting never reaches up to the calls that read them. */
#include "copy.h"

pm__copy_counters pm__copy_count;
