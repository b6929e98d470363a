/* Compiles the public header on its own (no other include first). */
#include "stof.h"

int main(void)
{
    stof_settings s;
    stof_default_settings(&s);
    return (int)sizeof(s) > 0 ? 0 : 1;
}
