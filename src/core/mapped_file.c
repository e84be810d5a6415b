#include "core/mapped_file.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

lm_status lm_mapped_file_open(const char *path, lm_mapped_file *out) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lm_error(LM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lm_error(LM_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lm_error(LM_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lm_error(LM_ERR_IO, "cannot map %s: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return LM_OK;
}

void lm_mapped_file_close(lm_mapped_file *file) {
    if (file && file->data) munmap((void *)file->data, file->size);
    if (file) {
        file->data = NULL;
        file->size = 0;
    }
}
