// Compiles the public header as C++ on its own.
#include "stof.h"

int main()
{
    stof_settings s;
    stof_default_settings(&s);
    return sizeof(s) > 0 ? 0 : 1;
}
