module example.com/qc-handler

go 1.22
