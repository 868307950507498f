/*
 * model_files.c - finding a model's files on disk: what a path is (regular file, directory,
 * GGUF magic) and the llama2.c tokenizer beside a checkpoint.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model_internal.h"

bool kiln_model_file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

bool kiln_model_is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

bool kiln_model_has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

/* llama2.c tokenizer beside the checkpoint: tokenizer.bin, else the only tok*.bin. */
char *kiln_model_find_llama2c_tokenizer(const char *model_path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    char cand[4352];
    snprintf(cand, sizeof cand, "%s/tokenizer.bin", dir);
    if (kiln_model_file_exists(cand)) return strdup(cand);
    DIR *dp = opendir(dir);
    if (!dp) return NULL;
    char *found = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "tok", 3) == 0 && len > 4 &&
            strcmp(e->d_name + len - 4, ".bin") == 0) {
            count++;
            free(found);
            snprintf(cand, sizeof cand, "%s/%s", dir, e->d_name);
            found = strdup(cand);
        }
    }
    closedir(dp);
    if (count != 1) {
        free(found);
        return NULL;
    }
    return found;
}
