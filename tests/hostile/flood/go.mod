module httpflood

go 1.26.0
